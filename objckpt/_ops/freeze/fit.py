"""A Freezer's frozen set held under `model.fit`, in every Keras flavour."""

from __future__ import annotations

import threading

import tensorflow as tf

from objckpt import _compat, errors

__all__ = ["FitHold"]


class FitHold:
    """Makes a Freezer's frozen set hold under `model.fit` (every Keras flavour).

    Keras traces `model.train_step` into a cached `model.train_function`; the
    optimizer methods it calls are captured then. The model's `train_step` is
    shadowed (an instance attribute, as `hook` shadows the optimizer's
    `apply_gradients`) by one that, while it is traced (or run eagerly), routes
    the model's current optimizer (after a recompile: the new one) through the
    Freezer, and afterwards checks that some Freezer variable went through it.
    The optimizer is hooked only for that call: a custom loop calling its
    `apply_gradients` itself gets the optimizer's own step. Under
    tf.distribute every replica's trace runs between the first one's start and
    the last one's end, so the hook is shared and counted. A train function
    made before is made afresh once, at `attach`.
    """

    def __init__(self, freezer, routes, guard):
        self.freezer, self.routes, self.guard = freezer, routes, guard
        self.model = freezer.model
        self.attached = False
        self.undo: list = []  # the train_step override
        self.lock = threading.Lock()
        self.active = 0  # train_step calls in progress (one per replica under a strategy)
        self.hooked = None  # (optimizer, undo) while they are
        self.refusal: str | None = None  # why a traced step cannot be held

    @staticmethod
    def applies(model) -> bool:
        """Whether the model has Keras' `fit` machinery (any flavour)."""
        return callable(getattr(model, "make_train_function", None)) and \
            callable(getattr(model, "train_step", None))

    @staticmethod
    def current(model) -> FitHold | None:
        """The hold attached to model now (its `train_step` is our wrapper), or None."""
        return getattr(vars(model).get("train_step"), "objckpt_hold", None)

    def attach(self) -> None:
        if self.refusal is not None:
            raise errors.UnsupportedObjectError(self.refusal)
        model, hold = self.model, self
        other = FitHold.current(model)
        if self.attached and other in (self, None):
            return  # None: something shadowed train_step on top of ours, which it calls
        if other is not None:
            # One hold per model: the most recent Freezer to attach wins; the one it
            # displaces stops acting under fit (a notebook cell run again makes a new
            # Freezer: the old one, unreachable, must not keep its variables frozen).
            other.displace()
        if self.attached:  # displaced by another hold since, or overridden on top
            _compat.restore_methods(model, self.undo)
            self.attached = False
        original = model.train_step

        def train_step(*args, **kwargs):
            # Left to AutoGraph like the original (a custom train_step may need it); the
            # checks around the call are not converted.
            routed = hold.before()
            try:
                outputs = original(*args, **kwargs)
                hold.after(routed)
            finally:
                hold.release(routed)
            return outputs

        train_step.objckpt_hold = hold  # found by the next Freezer's attach
        self.undo = _compat.override_methods(model, {"train_step": train_step})
        self.attached = True
        if getattr(model, "train_function", None) is not None:
            # Traced (or made, capturing train_step) before the hooks: make it afresh,
            # to be traced on its first call (also in the middle of fit, which looks
            # model.train_function up for every step).
            model.make_train_function(force=True)

    def displace(self) -> None:
        """Another Freezer attaches to this model: this hold stops acting under fit, and so
        do this Freezer's hooks of the model's optimizer (the train function is made afresh
        by the attach that follows)."""
        if self.attached:
            _compat.restore_methods(self.model, self.undo)
            self.undo = []
            self.attached = False
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            self.freezer.unhook(optimizer)

    def detach(self) -> None:
        if self.attached:
            _compat.restore_methods(self.model, self.undo)
            self.undo = []
            self.attached = False
            if getattr(self.model, "train_function", None) is not None:
                self.model.make_train_function(force=True)  # traced with the Freezer

    @tf.autograph.experimental.do_not_convert
    def before(self):
        if not self.attached:
            return None
        with self.lock:
            if self.active == 0:
                optimizer = getattr(self.model, "optimizer", None)
                if optimizer is not None and not self.routes.is_hooked(optimizer) and \
                        callable(getattr(optimizer, "apply_gradients", None)):
                    self.hooked = (optimizer, self.routes.override(optimizer))
            self.active += 1
        return self.guard.routed()

    @tf.autograph.experimental.do_not_convert
    def release(self, routed) -> None:
        if routed is None:
            return
        with self.lock:
            self.active -= 1
            if self.active == 0 and self.hooked is not None:
                _compat.restore_methods(*self.hooked)
                self.hooked = None

    @tf.autograph.experimental.do_not_convert
    def after(self, routed) -> None:
        if routed is None:
            return
        if self.guard.routed() != routed:
            return
        freezer = self.freezer
        optimizer = getattr(self.model, "optimizer", None)
        example = freezer.paths.index(freezer.frozen[0]) if freezer.frozen else 0
        keras3 = callable(getattr(optimizer, "stateless_apply", None))
        self.refusal = (
            f"Freezer: {type(self.model).__name__}.train_step passed none of the Freezer's "
            f"variables (e.g. `{freezer.paths[example]}` ({freezer.names[example]})) to the "
            f"model's optimizer ({type(optimizer).__name__}.apply_gradients"
            f"{' or .apply(grads, variables)' if keras3 else ''}), so model.fit cannot "
            "keep frozen variables from moving. Fix: update them in train_step with "
            "freezer.apply_gradients(self.optimizer, zip(grads, variables)), which honours "
            "freeze/unfreeze without retracing.")
        if freezer.frozen:
            raise _compat.past_autograph(errors.UnsupportedObjectError(self.refusal))
