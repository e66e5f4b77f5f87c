"""Matching: pool nodeTypeSelectors against NodeType properties (vCluster's requirement
operators), and Kubernetes label selectors against host labels (as database filters)."""
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact, In

from core.labels import field_error, key_errors, label_errors, value_errors

from .choices import SelectorOperator

OPERATORS = {op.value for op in SelectorOperator}
LABEL_SELECTOR_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist"}


def normalize_requirement(req: dict) -> tuple[str, str, list[str]]:
    """{property, operator?, value? | values[]} → (property, operator, values)."""
    op = req.get("operator", "") or ""
    values = req.get("values")
    if values is None:
        values = [] if req.get("value") is None else [req["value"]]
    return req["property"], op, [str(v) for v in values]


def validate_requirements(requirements) -> None:
    """A nodeTypeSelector: every requirement's problems, each at its own position ([0].operator)."""
    if not isinstance(requirements, list):
        raise ValidationError("must be a list of {property, operator, value(s)}")
    errors = []
    for i, req in enumerate(requirements):
        errors += _requirement_errors(i, req)
    if errors:
        raise ValidationError(errors)


def _requirement_errors(i: int, req) -> list[ValidationError]:
    if not isinstance(req, dict) or not isinstance(req.get("property"), str) or not req.get("property"):
        return [field_error((i,), "property is required")]
    unknown = sorted(set(map(str, req)) - {"property", "operator", "value", "values"})
    if unknown:
        return [field_error((i, unknown[0]), f"unknown field(s) {', '.join(unknown)}")]
    errors = key_errors(req["property"], (i, "property"), "property name")
    prop, op, values = normalize_requirement(req)
    where = (i, "operator")
    if op not in OPERATORS:
        errors.append(field_error(where, f"unknown operator {op!r}; expected one of "
                                         "In, NotIn, Exists, DoesNotExist, Gt, Lt (or none for equals)"))
    elif "value" in req and "values" in req:
        errors.append(field_error((i, "values"), "give value or values, not both"))
    elif op in ("", "In", "NotIn") and not values:
        errors.append(field_error((i,), f"operator {op or 'equals'} needs a value"))
    elif op in ("Exists", "DoesNotExist") and values:
        errors.append(field_error(where, f"operator {op} takes no value"))
    elif op in ("Gt", "Lt") and (len(values) != 1 or not _is_int(values[0])):
        errors.append(field_error(where, f"operator {op} needs one integer value"))
    elif op == "" and len(values) != 1:
        errors.append(field_error((i, "values"), "equals takes one value; use operator In for several"))
    return errors


def _is_int(text: str) -> bool:
    try:
        int(text)
    except (TypeError, ValueError):
        return False
    return True


def requirements_match(requirements: list[dict], properties: dict) -> bool:
    for req in requirements:
        prop, op, values = normalize_requirement(req)
        present = prop in properties
        actual = str(properties.get(prop, ""))
        if op in ("", "In"):
            ok = present and actual in values
        elif op == "NotIn":
            ok = not present or actual not in values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        elif op in ("Gt", "Lt"):
            ok = present and _is_int(actual) and (
                int(actual) > int(values[0]) if op == "Gt" else int(actual) < int(values[0]))
        else:
            ok = False
        if not ok:
            return False
    return True


def validate_label_selector(selector) -> None:
    """A Kubernetes LabelSelector (a NodeType's hosts): its operators, and keys and values as Kubernetes takes
    them; every problem, each at its position (matchLabels.role, matchExpressions[0].operator)."""
    if not isinstance(selector, dict):
        raise ValidationError("must be a mapping with matchLabels and/or matchExpressions")
    unknown = sorted(set(map(str, selector)) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise ValidationError(field_error((unknown[0],), f"unknown field(s) {', '.join(unknown)}"))
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ValidationError(field_error(("matchLabels",), "must map label keys to string values"))
    errors = label_errors(labels, ("matchLabels",))
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        where = ("matchExpressions", i)
        if not isinstance(expr, dict) or not expr.get("key"):
            errors.append(field_error(where, "key is required"))
            continue
        errors += key_errors(expr["key"], where + ("key",))
        if expr.get("operator") not in LABEL_SELECTOR_OPERATORS:
            errors.append(field_error(where + ("operator",), f"unknown operator {expr.get('operator')!r}; "
                                                             "expected In, NotIn, Exists or DoesNotExist"))
        for j, value in enumerate(expr.get("values") or []):
            errors += value_errors(str(value), where + ("values", j))
    if errors:
        raise ValidationError(errors)


def label_selector_q(selector: dict, field: str = "labels") -> Q:
    """A Kubernetes LabelSelector as a filter on a JSON label column (PostgreSQL and SQLite)."""
    q = Q()
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        q &= Q(Exact(KeyTextTransform(key, field), value))
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], [str(v) for v in expr.get("values") or []]
        has = Q(**{f"{field}__has_key": key})
        if op == "In":
            q &= Q(In(KeyTextTransform(key, field), values))
        elif op == "NotIn":
            q &= ~has | ~Q(In(KeyTextTransform(key, field), values))
        elif op == "Exists":
            q &= has
        else:
            q &= ~has
    return q


def label_selector_matches(selector: dict, labels: dict) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], [str(v) for v in expr.get("values") or []]
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
