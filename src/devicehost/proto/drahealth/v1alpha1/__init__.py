"""DRA health API v1alpha1 (DRAResourceHealth: NodeWatchResources), served by a driver (kubelet 1.34-1.36, gate ResourceHealthStatus)."""
