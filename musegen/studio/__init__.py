"""`musegen studio`: a local web page to continue a prompt and hear the result.

- `store`: the --out folder, one sub-folder per browser session (uploaded prompts, one folder per
  run written as `musegen sample` writes it), and the names a request may use in it;
- `models`: the checkpoints offered by name, loaded once by the server and once by each worker;
- `jobs`: one generation run, its notes reported while they are drawn, and its events for the page;
- `workers`: the processes that sample runs, one core each, relayed to the page by the server's threads;
- `live`: playing along: a page's live session, its bars fed to a model's streaming state and
  the answer's or accompaniment's notes streamed back as they become final;
- `server`: the Starlette app (JSON API, the streamed run, files, the static page in static/);
- `sound`: what the page's own synthesiser needs (its npm packages, the soundfont), or why it
  cannot run; `audio`: the server's WAVs, for download and where the page cannot play itself.
"""
