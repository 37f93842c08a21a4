"""DRA plugin API v1 (DRAPlugin: NodePrepareResources, NodeUnprepareResources), served by a driver."""
