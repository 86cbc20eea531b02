from enum import StrEnum


class ArtifactRefusedType0(StrEnum):
    BAD_PATH = "bad_path"
    NOT_A_FILE = "not_a_file"
    ORG_QUOTA = "org_quota"
    RUN_FILES = "run_files"
    RUN_QUOTA = "run_quota"
    SYMLINK = "symlink"
    TOO_LARGE = "too_large"
    UNREADABLE = "unreadable"

    def __str__(self) -> str:
        return str(self.value)
