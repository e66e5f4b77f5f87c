"""The drive's host query (the host with the relations its flows read), compiled once per process."""
# Every drive reads its host the same way: one SELECT of the host joined with the relations the registered flows read
# (hosts.lifecycle.RELATED: the claim, its tenant and node type), ~130 columns. Django compiles that SELECT anew on
# each query, which was most of the query's CPU and the largest single cost of a drive (py-spy, bench/fleet.py): here
# it is compiled once per process and database, with what Django's own iterator needs to turn the row into the
# objects (the columns' converters, the related objects' populators), and each drive only executes it. The objects
# are the same as the ORM's (tests/test_drive_host_query.py compares them field by field).
import logging
import threading

from django.db import connections
from django.db.models.query import get_related_populators

from hosts.lifecycle import RELATED
from hosts.models import BareMetalHost

log = logging.getLogger(__name__)
_plans: dict[tuple, "_Plan"] = {}
_plans_lock = threading.Lock()


def host_for_drive(host_id: int, using: str = "default") -> BareMetalHost | None:
    """The host with its claim, the claim's tenant and node type loaded (None when it is gone), as
    `BareMetalHost.objects.select_related(*RELATED).get(pk=host_id)` would give it."""
    related = tuple(sorted(RELATED))
    key = (using, related)
    plan = _plans.get(key)
    if plan is None:
        with _plans_lock:
            plan = _plans.get(key)
            if plan is None:
                try:
                    plan = _plans[key] = _Plan(related, using)
                except Exception:  # Django's internals moved: the ORM's own way, compiled per query
                    log.warning("the drive's host query could not be compiled once: using the ORM's", exc_info=True)
                    plan = _plans[key] = None
    if plan is None:
        return next(iter(BareMetalHost.objects.using(using).select_related(*related).filter(pk=host_id)
                         .order_by()), None)
    return plan.load(host_id)


class _Plan:
    """The compiled SELECT and what ModelIterable (django.db.models.query) does with its row, prepared once."""

    def __init__(self, related: tuple[str, ...], using: str):
        # No ORDER BY (the model's default ordering) for a query by primary key: compiling it cost a third more.
        queryset = BareMetalHost.objects.using(using).select_related(*related).filter(pk=0).order_by()
        compiler = queryset.query.get_compiler(using=using)
        self.sql, params = compiler.as_sql()
        if list(params) != [0]:
            raise ValueError(f"unexpected parameters of the host query: {params!r}")
        self.using = using
        select, klass_info = compiler.select, compiler.klass_info
        self.model = klass_info["model"]
        fields = klass_info["select_fields"]
        self.start, self.end = fields[0], fields[-1] + 1
        self.init_list = [column[0].target.attname for column in select[self.start:self.end]]
        self.converters = list(compiler.get_converters([column[0] for column in select]).items())
        self.populators = get_related_populators(klass_info, select, using)  # stateless: shared by threads

    def load(self, host_id: int) -> BareMetalHost | None:
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(self.sql, [host_id])
            row = cursor.fetchone()
        if row is None:
            return None
        row = list(row)
        for position, (converters, expression) in self.converters:
            value = row[position]
            for converter in converters:
                value = converter(value, expression, connection)
            row[position] = value
        host = self.model.from_db(self.using, self.init_list, row[self.start:self.end])
        for populator in self.populators:
            populator.populate(row, host)
        return host
