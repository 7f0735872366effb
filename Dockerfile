# The proxy (and later the learner). vLLM itself runs from the official image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY proxy ./proxy
COPY learner ./learner
COPY migrations ./migrations
RUN pip install --no-cache-dir .
ENV ONTHEJOB_HOST=0.0.0.0
EXPOSE 8080
CMD ["onthejob", "serve"]
