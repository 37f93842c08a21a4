"""Device plugin API v1beta1 (served by each resource, Registration served by the kubelet)."""
