"""Errors caused by input a user can fix: printed as one short message, without a traceback."""


class UserError(Exception):
    """Bad configuration or missing files: the message names the problem and the fix."""
