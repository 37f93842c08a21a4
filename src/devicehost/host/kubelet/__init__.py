"""The kubelet's side as the host meets it: the ``kubelet.sock`` watch, the Register client, and
the plugin-watcher registration service."""
