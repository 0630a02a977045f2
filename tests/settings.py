"""Test settings: the demo project's, on the embedded defaults unless the services
suite points DATABASE_URL / CACHE_URL at the real servers."""

import os

os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz")

from project.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LLM_ROUTING = {"DEFAULT_CHAIN": []}

# The embedded suite never talks to a broker, whatever the environment says.
CELERY_BROKER_URL = ""
CELERY_TASK_ALWAYS_EAGER = True
