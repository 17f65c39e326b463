"""Generated data sets and recordings: tasks that need no download."""
from .cue_accumulation import cue_accumulation
from .delayed_bars import delayed_bars
from .delayed_match import delayed_match_to_sample
from .digits import digits_saccades, saccade_path
from .gesture_recordings import GESTURE_NAMES, gesture_recordings
from .moving_bars import (DIRECTION_NAMES, MotionScenes, dvs_events, moving_bars,
                          render_scenes, sample_scenes)
from .spoken_digits import synthetic_shd

__all__ = ["DIRECTION_NAMES", "GESTURE_NAMES", "MotionScenes", "cue_accumulation",
           "delayed_bars", "delayed_match_to_sample", "digits_saccades", "dvs_events",
           "gesture_recordings", "moving_bars", "render_scenes", "saccade_path",
           "sample_scenes", "synthetic_shd"]
