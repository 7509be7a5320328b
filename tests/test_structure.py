"""The shape of the tree: no import cycle among coacto's modules at import time, no include cycle
among native/src's files (docs/ARCHITECTURE.md). A cycle is how a module that should be a leaf
starts depending on everything; these tests name the modules on it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    mods = {}
    for p in (ROOT / "coacto").rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _module_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """Imports that run when the module is imported: its body, inside if / try blocks too, not
    inside functions (an import in a function runs when it is called)."""
    out = []

    def visit(body):
        for n in body:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                out.append(n)
            elif isinstance(n, (ast.If, ast.Try)):
                for block in (n.body, n.orelse, getattr(n, "finalbody", [])):
                    visit(block)
                for h in getattr(n, "handlers", []):
                    visit(h.body)

    visit(tree.body)
    return out


def _targets(mods: dict, current: str, node: ast.stmt) -> set[str]:
    package = current if mods[current].name == "__init__.py" else current.rpartition(".")[0]
    found = set()
    if isinstance(node, ast.ImportFrom):
        if node.level:
            parts = package.split(".")
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in mods else base)
    else:
        found.update(alias.name for alias in node.names)
    return {m for m in found if m in mods and m != current}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_coacto():
    mods = _modules()
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        for node in _module_level_imports(ast.parse(path.read_text())):
            edges[name] |= _targets(mods, name, node)
    assert _cycles(edges) == []


def test_no_include_cycle_in_native_src():
    src = ROOT / "native" / "src"
    files = {p.relative_to(src).as_posix(): p for p in src.rglob("*.[ch]")}
    edges = {}
    for name, path in files.items():
        includes = re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M)
        here = Path(name).parent
        targets = set()
        for inc in includes:
            for cand in ((here / inc).as_posix(), inc):  # relative to the file, or to src/
                if cand in files:
                    targets.add(cand)
                    break
        edges[name] = targets - {name}
    assert _cycles(edges) == []


def test_no_cycle_through_deferred_imports():
    """Imports inside functions count too: deferring an import breaks a cycle at import time, not
    in the design."""
    mods = _modules()
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges[name] |= _targets(mods, name, node)
    assert _cycles(edges) == []


def test_the_activation_and_op_codes_agree_with_the_c_header():
    """coacto/ir.py and native/include/coacto.h number activations and ops twice; a code out of
    step would run another function than the one imported."""
    from coacto import ir
    from coacto.native import lib

    acts = {n: getattr(ir, n) for n in dir(ir) if n.startswith("ACT_")}
    assert {n: getattr(lib, "COACTO_" + n, None) for n in acts} == acts
    assert lib.COACTO_ACT_COUNT == len(acts)
    for code, name in ir.OP_NAMES.items():
        assert getattr(lib, f"COACTO_OP_{name}", None) == code, name


def test_each_ops_contract_agrees_with_the_c_table():
    """coacto/ir.py OPS and native/src/ops.c's table state each op's inputs, arrays and
    parameter counts once per language: a slot out of step would hand an op another value."""
    from coacto import ir
    from coacto.native import ffi, lib

    assert len(ir.OPS) == lib.COACTO_OP_COUNT
    info = ffi.new("coacto_op_info *")
    for name, c in ir.OPS.items():
        assert lib.coacto_op_contract(c.code, info) == lib.COACTO_OK, name
        got = (ffi.string(info.name).decode(), (info.min_inputs, info.max_inputs), info.arrays,
               info.iparams, info.fparams)
        assert got == (name, c.inputs, len(c.arrays), c.n_iparams, c.n_fparams)
        assert c.n_iparams <= 32 and c.n_fparams <= 8  # coacto_layer_desc's room
    assert lib.coacto_op_contract(lib.COACTO_OP_COUNT, info) == lib.COACTO_ERR_INVALID_ARGUMENT
    assert lib.coacto_op_contract(-1, info) == lib.COACTO_ERR_INVALID_ARGUMENT


# ------------------------------------------------------------------------- the frontend's handlers

FRONTEND = ROOT / "coacto" / "frontend"


def _private_context_reads(tree: ast.Module) -> list[str]:
    """Names starting with "_" read from a handler's context: an attribute of a function's first
    parameter (what a handler, or a helper it passes the context to, calls it) or of any ``ctx``,
    directly or through getattr."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        params = fn.args.posonlyargs + fn.args.args
        names = {"ctx"} | ({params[0].arg} if params else set())
        for n in ast.walk(fn):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                name, attr = n.value.id, n.attr
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and \
                    n.func.id in ("getattr", "setattr", "hasattr") and len(n.args) >= 2 and \
                    isinstance(n.args[0], ast.Name) and isinstance(n.args[1], ast.Constant) and \
                    isinstance(n.args[1].value, str):
                name, attr = n.args[0].id, n.args[1].value
            else:
                continue
            if name in names and attr.startswith("_"):
                found.append(f"{getattr(fn, 'name', 'lambda')} line {n.lineno}: {name}.{attr}")
    return sorted(set(found))


def test_private_context_read_finder_finds_them():
    bad = ("def _h(ctx, ins):\n"
           "    return [ctx.attr('axis'), ctx._attr('axis')]\n"
           "def _factory(kind):\n"
           "    def run(imp, ins):\n"
           "        return getattr(imp, '_const')(ins[1], 'k')\n"
           "    return run\n"
           "def _helper(c, x):\n"
           "    return c._materialize(x), x._private\n")
    assert _private_context_reads(ast.parse(bad)) == [
        "_h line 2: ctx._attr", "_helper line 8: c._materialize", "run line 5: imp._const"]
    assert _private_context_reads(ast.parse("def ok(ctx, ins):\n    return ctx.attr('x')\n")) == []


def test_handlers_read_only_the_public_context():
    """coacto/frontend/context.py is the handler API: handlers (ops/, folding.py) use its public
    names only, so the importer's internals can change without touching them."""
    modules = sorted((FRONTEND / "ops").glob("*.py")) + [FRONTEND / "folding.py"]
    assert len(modules) >= 5
    found = [f"{p.relative_to(ROOT)}: {r}" for p in modules
             for r in _private_context_reads(ast.parse(p.read_text()))]
    assert found == []


def test_every_handler_module_is_loaded():
    """A module of coacto/frontend/ops/ that nothing imports would register no handler."""
    import sys

    import coacto.frontend  # noqa: F401
    from coacto.frontend import registry

    for p in (FRONTEND / "ops").glob("*.py"):
        if p.stem != "__init__":
            assert f"coacto.frontend.ops.{p.stem}" in sys.modules, p.name
    assert registry.OPS and all(
        any(getattr(h, kind) for kind in registry.KINDS) for h in registry.OPS.values())
