"""No import circle inside any product app, counting function-local imports: module by module (grimp's graph,
the one import-linter reads), beside the sibling contract in .importlinter that checks sub-packages."""
import grimp

APPS = ["core", "events", "pools", "access", "hosts", "claims", "autonodes", "manifests", "console", "lab", "agent",
        "vmetal_console"]


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module are circles."""
    index, low, on, stack, found = {}, {}, set(), [], []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_sees_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_product_app_has_an_import_circle():
    graph = grimp.build_graph(*APPS, include_external_packages=False, cache_dir=None)
    circles = []
    for app in APPS:
        modules = {m for m in graph.modules if m == app or m.startswith(app + ".")}
        edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules - {m} for m in modules}
        circles += strongly_connected(edges)
    assert circles == []
