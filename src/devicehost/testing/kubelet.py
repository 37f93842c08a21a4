"""The kubelet stand-in's old address: it lives in :mod:`devicehost.standin` now.

Kept so that tests written against ``devicehost.testing.kubelet`` keep working; new code imports
from :mod:`devicehost.testing` or :mod:`devicehost.standin`.
"""

from devicehost.standin import *  # noqa: F403
from devicehost.standin import __all__ as __all__
