"""Errors caused by input a user can fix: printed as one short message, without a traceback. Every
layer raises them, so this module imports nothing."""


class UserError(Exception):
    """Bad configuration or missing files: the message names the problem and the fix."""

    # Every process of a multi-device run reads the same config and data, so raises the same
    # error: rank 0 alone prints it. An error that only some processes raise sets False.
    raised_on_every_rank = True


def find_user_error(error: BaseException) -> UserError | None:
    """The UserError behind `error`, also when Hydra's instantiate wrapped it in its own."""
    while error is not None and not isinstance(error, UserError):
        error = error.__cause__ or error.__context__
    return error


def message(error: UserError) -> str:
    """`error`'s own message, also of one raised in a DataLoader worker (whose message is then the
    worker's traceback, ending with the line `<class>: <message>`)."""
    text = str(error)
    if text.startswith("Caught ") and " in DataLoader worker process " in text:
        return text.rstrip().splitlines()[-1].partition(": ")[2]
    return text
