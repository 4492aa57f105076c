"""Errors caused by input a user can fix: printed as one short message, without a traceback."""


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
    """`error`'s own message. One raised in a DataLoader worker reaches the main process as a new
    error of its class whose message is the worker's traceback ("Caught UserError in DataLoader
    worker process 0. Original Traceback ..."), ending with the line `<class>: <message>`."""
    text = str(error)
    if text.startswith("Caught ") and " in DataLoader worker process " in text:
        return text.rstrip().splitlines()[-1].partition(": ")[2]
    return text
