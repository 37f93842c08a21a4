"""Dynamic Resource Allocation: the second way the host serves a resource, beside the device plugin.

A resource whose ``serve_through`` is ``dra`` or ``both`` is attached to the :class:`DraDriver` of
its driver name. The driver publishes the resource's devices as a ResourceSlice for this node
(:mod:`.publisher`), serves the kubelet's DRAPlugin service on its own socket and registers it
through ``plugins_registry`` (:mod:`.driver`), and prepares claims with the backend's allocate
hook and unprepares them with its release hook, kept across restarts in a checkpoint
(:mod:`.checkpoint`). The API server is reached through the :class:`.cluster.Cluster` seam:
:mod:`.kube` in production, an in-memory stand-in in the test kit.
"""
