"""Bounds on integers and nesting that every accepted record respects.

JSON itself bounds neither, but everything the worker writes back (outputs, state records, dead
letters) must serialize: orjson writes integers of at most 64 bits and nests at most 254 levels.
So every integer field accepted on the wire is an ``Int64`` (pydantic's lax mode would otherwise
turn ``"18446744073709551616"`` into a Python int that cannot be written back), and a record
nested deeper than ``MAX_JSON_DEPTH`` is refused before anything of it is kept or copied.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
NonNegativeInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]
PositiveInt64 = Annotated[int, Field(gt=0, le=INT64_MAX)]

MAX_JSON_DEPTH = 128
"""Levels of arrays and objects a record may nest, counted from the envelope itself. Well under
what orjson writes (254), so any value copied into an output or state record fits there too."""

MAX_TOKEN_ID = 2**32 - 1
"""The largest token id the ``tokenizers`` backend takes (a u32): larger or negative ids make it
raise, in vLLM's tokenizer too."""
