"""Every bundled backend's tests write CDI specs in a temporary dir and fail if they changed the
machine's CDI dirs (the same guard as tests/, tests/support/cdi_guard.py)."""

from cdi_guard import cdi_in_tmp, machine_cdi_dirs_untouched

__all__ = ["cdi_in_tmp", "machine_cdi_dirs_untouched"]
