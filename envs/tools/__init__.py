"""verl tools of the tool-use environment (``code_interpreter``)."""
