# One image for both roles of the distributed deployment (docker-compose.yml): the web process (Daphne)
# and the Celery GPU workers. PyPI's torch for Linux is the CUDA build, so the same image runs on GPUs;
# build with --build-arg EXTRAS=gpu to add CuPy for the device kernels.
FROM python:3.11-slim-bookworm

ARG EXTRAS=""
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md manage.py ./
COPY engine engine
COPY workbench workbench
COPY scripts scripts
COPY templates templates
COPY static static
# Editable, so the project's templates and static files resolve from /app as they do in a checkout.
RUN if [ -n "$EXTRAS" ]; then pip install -e ".[$EXTRAS]"; else pip install -e .; fi

RUN useradd --create-home --uid 1000 workbench
USER workbench
EXPOSE 8000
CMD ["python", "-m", "workbench.serve", "-b", "0.0.0.0", "-p", "8000"]
