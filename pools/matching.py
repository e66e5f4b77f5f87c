"""Matching: pool nodeTypeSelectors against NodeType properties (vCluster's requirement
operators), and Kubernetes label selectors against host labels (as database filters)."""
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact, In

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


def validate_requirements(requirements, field: str = "nodeTypeSelector") -> None:
    if not isinstance(requirements, list):
        raise ValidationError({field: "must be a list of {property, operator, value(s)}"})
    for i, req in enumerate(requirements):
        where = f"{field}[{i}]"
        if not isinstance(req, dict) or not isinstance(req.get("property"), str) or not req.get("property"):
            raise ValidationError({field: f"{where}: property is required"})
        unknown = set(req) - {"property", "operator", "value", "values"}
        if unknown:
            raise ValidationError({field: f"{where}: unknown field(s) {', '.join(sorted(unknown))}"})
        prop, op, values = normalize_requirement(req)
        if op not in OPERATORS:
            raise ValidationError({field: f"{where}: unknown operator {op!r}; expected one of "
                                          "In, NotIn, Exists, DoesNotExist, Gt, Lt (or none for equals)"})
        if "value" in req and "values" in req:
            raise ValidationError({field: f"{where}: give value or values, not both"})
        if op in ("", "In", "NotIn") and not values:
            raise ValidationError({field: f"{where}: operator {op or 'equals'} needs a value"})
        if op in ("Exists", "DoesNotExist") and values:
            raise ValidationError({field: f"{where}: operator {op} takes no value"})
        if op in ("Gt", "Lt"):
            if len(values) != 1 or not _is_int(values[0]):
                raise ValidationError({field: f"{where}: operator {op} needs one integer value"})
        if op == "" and len(values) != 1:
            raise ValidationError({field: f"{where}: equals takes one value; use operator In for several"})


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


def validate_label_selector(selector, field: str = "selector") -> None:
    if not isinstance(selector, dict):
        raise ValidationError({field: "must be a mapping with matchLabels and/or matchExpressions"})
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValidationError({field: f"unknown field(s) {', '.join(sorted(unknown))}"})
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ValidationError({field: "matchLabels must map label keys to string values"})
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        if not isinstance(expr, dict) or not expr.get("key"):
            raise ValidationError({field: f"matchExpressions[{i}]: key is required"})
        if expr.get("operator") not in LABEL_SELECTOR_OPERATORS:
            raise ValidationError({field: f"matchExpressions[{i}]: unknown operator {expr.get('operator')!r}; "
                                          "expected In, NotIn, Exists or DoesNotExist"})


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
