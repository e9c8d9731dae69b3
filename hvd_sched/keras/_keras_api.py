"""The names `_keras2` and `_keras3` both define: what `_backend` exports for the running Keras."""

__all__ = ["NAMES"]

#: Every name of the per-version hook modules (tests/keras/test_hooks.py checks that both define each).
NAMES = ("KERAS_MAJOR", "keras", "HOOKS", "OPTIMIZER_TYPES", "LearningRateSchedule", "is_optimizer", "is_legacy",
         "is_sgd", "momentum_of", "variable_name", "momentum_slot", "all_momentum_slots", "build_slots",
         "optimizer_variables", "unwrap", "skips_iterations", "learning_rate_variable", "in_xla_compilation",
         "steps_per_execution", "get_value", "register", "is_horovod_keras_wrapped", "scheduled_mixin",
         "distributed_optimizer", "distribution_problem", "backing_variables", "folds_factor", "is_variable",
         "scale_variable", "counts_skipped_steps", "BUILTIN_OPTIMIZERS", "is_distributed", "layers_of",
         "names_regex", "micro_batches", "micro_batch_count", "update_index", "is_loss_scaled",
         "sums_micro_batches", "learning_rate_of", "install_schedule", "legacy_twin", "register_name")
