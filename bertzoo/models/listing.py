"""`list_presets()`: the built-in presets with their sizes."""

from bertzoo.models.bert_backbone import count_backbone_parameters
from bertzoo.saving.preset import builtin_presets


def list_presets(verbose=True):
    """Returns (and by default prints) the built-in presets with parameter counts.

    Example:
    ```python
    info = bertzoo.list_presets(verbose=False)
    info["base"]["parameters"]  # 109482240
    ```
    """
    rows = {}
    for name, definition in builtin_presets().items():
        c = definition["backbone"]
        rows[name] = {
            "layers": c["num_layers"],
            "hidden_dim": c["hidden_dim"],
            "num_heads": c["num_heads"],
            "intermediate_dim": c["intermediate_dim"],
            "embedding_dim": c.get("embedding_dim") or c["hidden_dim"],
            "num_groups": c.get("num_groups") or c["num_layers"],
            "vocabulary_size": c["vocabulary_size"],
            "parameters": count_backbone_parameters(c),
            "description": definition.get("description", ""),
        }
    if verbose:
        print(format_presets_table(rows))
    return rows


def format_presets_table(rows):
    """A Markdown table of `list_presets()` rows (the README's table)."""
    header = "| preset | L | H | A | I | E | groups | vocab | parameters |"
    lines = [header, "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for name, r in rows.items():
        lines.append(
            f"| `{name}` | {r['layers']} | {r['hidden_dim']} | {r['num_heads']} | "
            f"{r['intermediate_dim']} | {r['embedding_dim']} | {r['num_groups']} | "
            f"{r['vocabulary_size']:,} | {r['parameters']:,} |"
        )
    return "\n".join(lines)
