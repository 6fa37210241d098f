"""What the page shows as the user's to fix. A request is checked in `comparison.request` (an InputError); the page's
own checks (the Explore tab's) raise UserError. Either way the message says what to do."""
from __future__ import annotations

from ..comparison.tasks import InputError


class UserError(Exception):
    """Something the user can fix; the message says what to do."""


USER_ERRORS = (UserError, InputError)   # shown to the user as they are; anything else as a failure
