"""The training engine shared by all tasks: trainer, schedules, checkpoints, metrics, recipes,
torchrun. It knows no model, task or data module (a task hands it a loss and an evaluation):
imports files/ only."""

from scratchformer.training import distributed
from scratchformer.training.checkpoint import load_config, load_training_state, load_weights, save_checkpoint
from scratchformer.training.config import TrainConfig
from scratchformer.training.metrics import MetricsLog, plot_curves
from scratchformer.training.run_checks import check_run, resolve_device
from scratchformer.training.schedule import lr_multiplier
from scratchformer.training.trainer import Trainer, TrainingTask, TrainResult

__all__ = [
    "MetricsLog",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingTask",
    "check_run",
    "distributed",
    "load_config",
    "load_training_state",
    "load_weights",
    "lr_multiplier",
    "plot_curves",
    "resolve_device",
    "save_checkpoint",
]
