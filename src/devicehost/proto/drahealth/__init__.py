"""Kubelet DRA health API (the DRAResourceHealth service a DRA driver serves to the kubelet)."""
