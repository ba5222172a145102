"""Each target's lowering table (``codegen/<target>/lowerings/``): every entry names a
registered op that declares an opaque emit (a misspelt op type would leave the op running its
reference with no error), and the lookup picks the target's own lowering over the op's
generic rule."""
from pdjit.codegen.target import GENERIC, Lowerings, get_target
from pdjit.framework import registry


def test_every_entry_names_an_opaque_op():
    for name in ("cpu", "cuda"):
        table = get_target(name).lowerings
        types = table.op_types()
        assert types, name
        bad = sorted(t for t in types if registry.lookup(t) is None or
                     not isinstance(registry.get(t).emit, registry.Opaque))
        assert not bad, f"{name}: lowerings of unknown or non-opaque ops: {bad}"
        generic = sorted(t for t in types if table.get(t) == GENERIC and
                         registry.get(t).emit.lower is None)
        assert not generic, f"{name}: generic entries for ops without a generic rule: {generic}"


def test_lookup_order():
    own = lambda ctx: ["own"]  # noqa: E731
    table = Lowerings("pdjit.codegen.python")  # a package with no lowering modules of its own
    table.lowering("with_own", host=True)(own)
    table.generic("listed")

    class Host(type(get_target("python"))):
        lowerings = table

    class Device(Host):
        device = True

    generic = registry.Opaque(lambda ctx: ["generic"])
    target, device = Host(), Device()
    assert target.lowering("with_own", generic).lower is own
    assert target.lowering("with_own", generic).host
    assert target.lowering("other", generic) is None          # no generic_lowerings
    assert device.lowering("listed", generic) is generic
    assert device.lowering("listed", registry.Opaque()) is None
    target.generic_lowerings = True
    assert target.lowering("other", generic) is generic
    assert target.lowering("other", registry.Opaque()) is None
