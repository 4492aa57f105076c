"""Errors caused by input a user can fix: printed as one short message, without a traceback. Every
layer raises them, so this module imports no other of kindling's."""

from collections.abc import Iterator


class UserError(Exception):
    """Bad configuration or missing files: the message names the problem and the fix."""

    # Every process of a multi-device run reads the same config and data, so raises the same
    # error: rank 0 alone prints it. An error that only some processes raise sets False.
    raised_on_every_rank = True


def chain(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then each error behind it (its cause, else the one it was raised during)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def find_user_error(error: BaseException) -> UserError | None:
    """The UserError behind `error`, also when Hydra's instantiate wrapped it in its own."""
    return next((e for e in chain(error) if isinstance(e, UserError)), None)


def message(error: UserError) -> str:
    """`error`'s own message, also of one raised in a DataLoader worker (whose message is then the
    worker's traceback, ending with the line `<class>: <message>`)."""
    text = str(error)
    if text.startswith("Caught ") and " in DataLoader worker process " in text:
        return text.rstrip().splitlines()[-1].partition(": ")[2]
    return text
