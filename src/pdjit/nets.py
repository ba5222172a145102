"""``fluid.nets``: Fluid 1.x's composite networks built from layers."""
__all__: list = []
