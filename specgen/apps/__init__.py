"""The tool's uses as pure logic: chat templates and conversations (chat), one-shot file rewriting (rewrite)."""
