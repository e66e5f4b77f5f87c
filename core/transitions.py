"""Compare-and-swap state changes, for any model with a state field and a table of allowed changes.

A batch of rows that share one state moves to another with one UPDATE ... WHERE state = <expected>; if
fewer rows changed than asked, another writer moved one first and nothing is changed (the caller's
transaction rolls back). hosts.services.hosts_transition_batch and claims.phases.claims_transition build on it."""
from collections.abc import Mapping


class IllegalTransition(Exception):
    """The table does not allow this change from this state."""


class ConcurrentTransition(Exception):
    """Another writer changed the row between our read and our write."""


def check_transition(table: Mapping[str, frozenset[str]], from_state: str, to_state: str, name: str,
                     advice: Mapping[str, tuple[str, str]] | None = None) -> None:
    """Raise IllegalTransition unless the table allows from_state → to_state. The message is for a person: what
    the row is, why that stops the change, and what to do instead (`advice`: {from_state: (why, what to do)}),
    never the table's row of allowed states."""
    if to_state in table.get(from_state, frozenset()):
        return
    why, do = (advice or {}).get(from_state, ("", ""))
    message = f"{name} is {from_state}{f' ({why})' if why else ''}, so it cannot go to {to_state}"
    raise IllegalTransition(f"{message}: {do}" if do else message)


def swap(model, *, ids: list[int], field: str, expected: str, values: dict, what: str) -> None:
    """UPDATE model SET values WHERE pk IN ids AND field = expected; ConcurrentTransition unless all changed."""
    changed = model.objects.filter(pk__in=ids, **{field: expected}).update(**values)
    if changed != len(ids):
        raise ConcurrentTransition(f"{len(ids) - changed} of {len(ids)} {what}(s) left {expected} meanwhile")
