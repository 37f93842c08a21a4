"""Plugin registration API v1 (the kubelet's plugins_registry watcher path)."""
