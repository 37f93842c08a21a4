"""Kubelet pod-resources API (the PodResourcesLister the kubelet serves)."""
