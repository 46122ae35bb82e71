"""An optimizer's own `apply_gradients` (and Keras 3's `apply`) routed through a
`GuardedApply`: shadowed by instance attributes, and restored on `unhook`."""

from __future__ import annotations

from objckpt import _compat

__all__ = ["OptimizerRoutes"]


class OptimizerRoutes:
    """The optimizers routed through one `GuardedApply`.

    Attributes:
      guard: the `GuardedApply`.
      hooked: id(optimizer) -> (optimizer, what `_compat.restore_methods` undoes).
    """

    def __init__(self, guard):
        self.guard = guard
        self.hooked: dict = {}

    def is_hooked(self, optimizer) -> bool:
        """Whether `hook(optimizer)` is in place."""
        return id(optimizer) in self.hooked

    def hook(self, optimizer) -> None:
        """Routes every call of the optimizer's `apply_gradients` (and `apply`) through the
        guard until `unhook`; hooking twice changes nothing."""
        if id(optimizer) not in self.hooked:
            self.hooked[id(optimizer)] = (optimizer, self.override(optimizer))

    def unhook(self, optimizer) -> None:
        """Undoes `hook(optimizer)`; an optimizer never hooked is left as it is."""
        entry = self.hooked.pop(id(optimizer), None)
        if entry is not None:
            _compat.restore_methods(optimizer, entry[1])

    def override(self, optimizer) -> list:
        """Shadows the optimizer's `apply_gradients` (and Keras 3's `apply`) with calls
        through the guard; returns what `_compat.restore_methods` undoes."""
        guard = self.guard
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars, *args, **kwargs):
            return guard.apply(optimizer, original, grads_and_vars, *args, **kwargs)

        methods = {"apply_gradients": apply_gradients}
        if callable(getattr(optimizer, "stateless_apply", None)) and \
                callable(getattr(optimizer, "apply", None)):
            # Keras 3: apply_gradients calls apply(grads, variables), which custom
            # train_steps also call themselves (Keras 3's guide does).
            original_apply = optimizer.apply

            def apply_pairs(pairs, *args, **kwargs):
                return original_apply([g for g, _ in pairs], [v for _, v in pairs],
                                      *args, **kwargs)

            def apply(grads, trainable_variables=None, *args, **kwargs):
                if trainable_variables is None:  # the optimizer's own list: not routed, so
                    return original_apply(grads, None, *args, **kwargs)  # fit refuses it
                return guard.apply(optimizer, apply_pairs,
                                   zip(list(grads), list(trainable_variables)), *args, **kwargs)

            methods["apply"] = apply
        return _compat.override_methods(optimizer, methods)
