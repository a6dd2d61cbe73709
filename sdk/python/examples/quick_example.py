# The seed's quick example with `import boxlite` replaced by `import airlock`.
import asyncio

import airlock

async def main() -> None:
    # CodeBox defaults to the "python:slim" image; no arguments required
    try:
        async with airlock.CodeBox() as cb:
            # run() hands the code to python -c inside the sandbox and returns the stdout string
            output = await cb.run("print('Hello from a microVM!')")
            print(output)  # -> Hello from a microVM!
    except RuntimeError as e:
        # Startup issues such as image pull failure / no virtualization raise a standard RuntimeError
        print(f"CodeBox failed to start: {e}")

if __name__ == "__main__":
    asyncio.run(main())
