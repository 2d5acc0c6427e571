"""asyncio support: ``await request``.

The library has no completion file descriptor to hand to the event loop
yet, so a request is awaited by testing it between event-loop turns, with a
back-off from 0 to 1 ms: the loop keeps running other tasks, a request that
completes at once costs one test.
"""
import asyncio


async def await_request(req):
    delay = 0.0
    while not req.done():
        await asyncio.sleep(delay)
        delay = min(delay * 2 if delay else 1e-5, 1e-3)
    return req.result()
