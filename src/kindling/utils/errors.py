"""Errors caused by input a user can fix: printed as one short message, without a traceback."""


class UserError(Exception):
    """Bad configuration or missing files: the message names the problem and the fix."""

    # True for errors that every process of a multi-device run raises together: rank 0 prints it.
    raised_on_every_rank = False


def find_user_error(error: BaseException) -> UserError | None:
    """The UserError behind `error`, also when Hydra's instantiate wrapped it in its own."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, UserError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
