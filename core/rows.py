"""Writing many rows' own values in one statement."""
import datetime
import decimal
import ipaddress
import json
import uuid
from collections.abc import Sequence

from django.db import connections, models, router
from psycopg.types.json import Jsonb

# The rows go to PostgreSQL as one JSON document, read back into the table's own row type
# (jsonb_populate_recordset): one parameter, so the client neither quotes nor parses hundreds of them (Django's
# bulk_create quotes an array per column element by element, bulk_update builds a CASE per row and field; psycopg
# parses a statement of more than 50 parameters again at each call).


def rows_update(objs: Sequence[models.Model], fields: Sequence[str]) -> None:
    """Write each object's `fields` (as they are on the object) to its row, in one statement. auto_now fields are
    written only when named, as the object holds them."""
    objs = list(objs)
    if not objs:
        return
    model = type(objs[0])
    connection = connections[router.db_for_write(model)]
    if connection.vendor != "postgresql":
        model.objects.bulk_update(objs, list(fields))
        return
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields)]
    qn = connection.ops.quote_name
    assign = ", ".join(f"{qn(f.column)} = v.{qn(f.column)}" for f in columns[1:])
    rows = [{f.column: _json(f.get_db_prep_save(getattr(obj, f.attname), connection)) for f in columns} for obj in objs]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {qn(meta.db_table)} AS t SET {assign} FROM jsonb_populate_recordset(NULL::"
                       f"{qn(meta.db_table)}, %s::jsonb) AS v WHERE t.{qn(meta.pk.column)} = v.{qn(meta.pk.column)}",
                       [json.dumps(rows)])


def rows_insert(objs: Sequence[models.Model]) -> None:
    """Insert the objects (new ones, of one model) in one statement and set their primary keys, as bulk_create
    does (auto_now_add and auto_now fields set, no signals, no save())."""
    objs = list(objs)
    if not objs:
        return
    model = type(objs[0])
    connection = connections[router.db_for_write(model)]
    if connection.vendor != "postgresql":
        model.objects.bulk_create(objs)
        return
    meta = model._meta
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    qn = connection.ops.quote_name
    names = ", ".join(qn(f.column) for f in fields)
    rows = [{f.column: _json(f.get_db_prep_save(f.pre_save(obj, True), connection)) for f in fields} for obj in objs]
    with connection.cursor() as cursor:
        # WITH ORDINALITY … ORDER BY: the ids come back in the order of the objects.
        cursor.execute(f"INSERT INTO {qn(meta.db_table)} ({names}) SELECT {names} FROM jsonb_populate_recordset("
                       f"NULL::{qn(meta.db_table)}, %s::jsonb) WITH ORDINALITY ORDER BY ordinality "
                       f"RETURNING {qn(meta.pk.column)}", [json.dumps(rows)])
        pks = [pk for pk, in cursor.fetchall()]
    for obj, pk in zip(objs, pks):
        obj.pk = pk
        obj._state.adding, obj._state.db = False, connection.alias


def _json(value):
    """A value as Django prepared it for the database, as the JSON document carries it: a JSON field's own value
    (its JSON becomes the jsonb column's), times in full (ISO 8601), an address, a UUID or a decimal as its text
    (PostgreSQL reads each column's text as its type)."""
    if isinstance(value, Jsonb):
        return value.obj
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID, ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return str(value)
    return value
