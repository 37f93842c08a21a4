"""Pod-resources API v1 (PodResourcesLister: List, GetAllocatableResources, Get), served by the kubelet."""
