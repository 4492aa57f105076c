"""Errors caused by input a user can fix: printed as one short message, without a traceback."""

from hydra.errors import CompactHydraException


class UserError(CompactHydraException):
    """Bad configuration or missing files: the message names the problem and the fix.

    A CompactHydraException: where one leaves a Hydra job (the end of a multirun), Hydra prints
    its message alone, and the whole traceback with HYDRA_FULL_ERROR=1.
    """

    # Every process of a multi-device run reads the same config and data, so raises the same
    # error: rank 0 alone prints it. An error that only some processes raise sets False.
    raised_on_every_rank = True


def find_user_error(error: BaseException) -> UserError | None:
    """The UserError behind `error`, also when Hydra's instantiate wrapped it in its own."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, UserError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def message(error: UserError) -> str:
    """`error`'s own message. One raised in a DataLoader worker reaches the main process as a new
    error of its class whose message is the worker's traceback ("Caught UserError in DataLoader
    worker process 0. Original Traceback ..."), ending with the line `<class>: <message>`."""
    text = str(error)
    if text.startswith("Caught ") and " in DataLoader worker process " in text:
        return text.rstrip().splitlines()[-1].partition(": ")[2]
    return text
