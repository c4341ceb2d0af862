"""Results as pandas DataFrames.  pandas is not a dependency, so every result's ``to_pandas`` asks here."""

from __future__ import annotations

__all__ = ["records_frame"]


def records_frame(records: list[dict], owner: str):
    """``records`` (one dict per row) as a DataFrame; an ImportError naming ``owner`` without pandas."""
    try:
        import pandas
    except ImportError:
        raise ImportError(f"{owner}.to_pandas needs pandas (pip install pandas)") from None
    return pandas.DataFrame.from_records(records)
