"""What operators read: metrics, probes and the status document, all from the host's state snapshots."""
