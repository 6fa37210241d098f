"""Every choice and limit a request can name, in one place: the page, the API, the validation, the catalog and the
command line all read them from here."""
from __future__ import annotations

from .engine.schedules import SCHEDULES

TASK_LABELS = {"chat": "Chat", "translation": "Translation", "summarization": "Summarization",
               "asr": "Speech recognition"}
TASKS = tuple(TASK_LABELS)
TEXT_TASKS = tuple(task for task in TASKS if task != "asr")
SCHEDULE_NAMES = tuple(SCHEDULES)                      # num_assistant_tokens_schedule
DRAFT_SOURCES = {"assistant": "assistant model", "assistant_lookup": "assistant + prompt lookup",
                 "prompt_lookup": "prompt lookup (no model)"}
MODE_LABELS = {"same-tokenizer": "same tokenizer", "different-tokenizer": "different tokenizers",
               "no-assistant": "no assistant"}                  # how a pair's assistant relates to its target
WINDOW_RANGE = (1, 64)                                 # num_assistant_tokens, the initial window
MAX_NEW_TOKENS_RANGE = (1, 1024)
TEMPERATURE_RANGE = (0.0, 2.0)                         # 0 means greedy
