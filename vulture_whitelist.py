"""Names that vulture (``make lint``) cannot see used. Registries and Typer commands are
covered by ``ignore_decorators`` in pyproject.toml; what is left is called from outside the
library's own code."""

# ruff: noqa
# type: ignore

__getattr__  # hookscope/__init__.py: PEP 562 lazy attributes, called by Python
load_model  # hookscope.load_model, reached through __init__'s lazy table
_.backward  # torch.autograd.Function.backward (called by autograd); Hooks.backward, the engine's
_.on_broken_pipe  # rich.console.Console calls it
_.logit  # ablate's result fields, read through asdict()
_.delta_logit
_.delta_prob
_.target_label
_.output_stats  # debug's non-finite event field, read through asdict()
_.macs  # structure's derived row fields, read through asdict()
_.macs_own
frame  # a signal handler's signature
out_shape  # FlopCounterMode passes it to a FLOP formula
_.__signature__  # read by typer (inspect.signature)
_.__annotations__  # read by typer
_.identical  # the sketch's bucket-for-bucket equality, which the merge tests assert
_.min_grad_norm  # the drift and log rules read these Rules fields by key (getattr)
_.max_mean_drift
_.max_std_drift
_.max_grad_norm
_.min_update_ratio
_.max_update_ratio
_.on_train_start  # Lightning calls its Callback hooks by name
_.on_train_batch_end
_.on_exception
_.on_before_optimizer_step
_.on_train_begin  # HF Trainer calls its TrainerCallback hooks by name
_.on_step_end
_.on_step_begin
_.should_log  # the Trainer reads the TrainerControl flag a callback sets
_.on_train_end
trainer  # the frameworks' callback signatures, passed positionally
batch_idx
control
_.mod_tracker  # FlopCounterMode reads the stub tracker structure.py puts in its place
_.get_usage_pieces  # click's usage line calls it on the parameter classes (options.py)
_.__doc__  # checks/log.py names each generated check rule (read by help())
vec_shape  # FlopCounterMode passes every operand shape to a formula (probes/structure.py)
bias_shape
