"""The archive's pure part: which rows of a batch go to which file, and which are already archived."""
