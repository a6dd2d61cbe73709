# The seed's "need both stdout and stderr / check the exit code".
import asyncio

import airlock

async def main() -> None:
    try:
        async with airlock.CodeBox() as cb:
            # Intentionally run code that raises an exception
            result = await cb.exec(
                "/usr/local/bin/python", "-c", "raise ValueError('boom')"
            )
            print("exit_code:", result.exit_code)  # non-zero
            print("stdout:", result.stdout)
            print("stderr:", result.stderr)        # the traceback appears here
    except RuntimeError as e:
        print(f"CodeBox failed to start: {e}")

if __name__ == "__main__":
    asyncio.run(main())
