"""Backends as the host holds them: loaded through stevedore, called through a typed facade."""
