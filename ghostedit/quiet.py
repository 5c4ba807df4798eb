"""Known-harmless warnings of the libraries GhostEdit loads models with, silenced by their exact words (nothing else
of theirs is hidden), so that what the CLI and the server print is what the person needs to read."""
from __future__ import annotations

import logging
import warnings

# transformers 5 reads a Qwen2.5-VL config's `rope_scaling` (as the released text encoder's config.json writes it)
# into `rope_parameters`, warning that the old name is deprecated; its `mrope_section` is then an "unrecognized key"
# of the default rope type, though the model's multimodal rotary embedding reads it from there
ROPE_SCALING_DEPRECATED = r"`rope_scaling` is deprecated and will be removed in a future version"
MROPE_SECTION_ONLY = "Unrecognized keys in `rope_parameters` for 'rope_type'='default': {'mrope_section'}"


class _DropMessage(logging.Filter):
    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message


def quiet_library_warnings() -> None:
    """Silences the known-harmless warnings above, once per process."""
    warnings.filterwarnings("ignore", message=ROPE_SCALING_DEPRECATED, category=FutureWarning)
    rope_logger = logging.getLogger("transformers.modeling_rope_utils")
    if not any(isinstance(each, _DropMessage) for each in rope_logger.filters):
        rope_logger.addFilter(_DropMessage(MROPE_SECTION_ONLY))
