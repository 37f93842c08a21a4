"""One resource served: its socket, its DevicePlugin servicer, its streams and its registration."""
