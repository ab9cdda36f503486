"""Vocabulary look-ups shared by bertzoo's tokenizers."""


class TokenLookupMixin:
    """Id <-> token look-ups and the special-token ids of a tokenizer that
    keeps its vocabulary in `self._vocabulary` (a tuple, in id order) and
    `self._token_to_id` (a mapping); the class names its special tokens
    (`PAD_TOKEN`, `UNK_TOKEN`, `CLS_TOKEN`, `SEP_TOKEN`, `MASK_TOKEN`)."""

    PAD_TOKEN = UNK_TOKEN = CLS_TOKEN = SEP_TOKEN = MASK_TOKEN = None

    def vocabulary_size(self):
        """Number of tokens in the vocabulary."""
        return len(self._vocabulary)

    def get_vocabulary(self):
        """The vocabulary as a list of strings (a copy), in id order."""
        return list(self._vocabulary)

    def token_to_id(self, token):
        """Id of `token`; ValueError if it is not in the vocabulary."""
        try:
            return self._token_to_id[token]
        except (KeyError, TypeError):
            raise ValueError(f"Token {token!r} is not in the vocabulary.") from None

    def id_to_token(self, id):
        """Token string for integer `id`; ValueError if out of range."""
        if isinstance(id, bool) or not hasattr(id, "__index__"):
            raise ValueError(f"`id` must be an integer, got {id!r}.")
        id = int(id)
        if not 0 <= id < len(self._vocabulary):
            raise ValueError(f"`id` must be in [0, {len(self._vocabulary) - 1}], got {id}.")
        return self._vocabulary[id]

    @property
    def pad_token_id(self):
        return self._token_to_id[self.PAD_TOKEN]

    @property
    def unk_token_id(self):
        return self._token_to_id[self.UNK_TOKEN]

    @property
    def cls_token_id(self):
        return self._token_to_id[self.CLS_TOKEN]

    @property
    def sep_token_id(self):
        return self._token_to_id[self.SEP_TOKEN]

    @property
    def mask_token_id(self):
        return self._token_to_id[self.MASK_TOKEN]
