"""DRA health API v1 (DRAResourceHealth: NodeWatchResources), served by a driver (kubelet 1.37 and later)."""
