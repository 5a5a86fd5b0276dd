"""The fault scenarios' stack, load and answers, and the checkers of the services' exactly-once effects."""
