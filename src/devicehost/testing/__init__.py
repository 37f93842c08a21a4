"""Test aids for devicehost: a kubelet stand-in that speaks the device plugin protocol.

Imported by ``devicehost run --simulate-kubelet`` as well as by tests, so nothing here imports
pytest. Start with :class:`devicehost.testing.kubelet.KubeletStandIn`.
"""
