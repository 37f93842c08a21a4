"""Kubelet DRA plugin API (the DRAPlugin service a DRA driver serves to the kubelet)."""
