"""The converter's one error: a line naming the file and what is wrong with it."""


class ConvertError(ValueError):
    def __init__(self, path, what):
        super().__init__(f"{path}: {what}")
