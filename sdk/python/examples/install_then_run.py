# The seed's "install a package, then execute" (needs PyPI and the internet
# from inside the box).
import asyncio

import airlock

async def main() -> None:
    try:
        async with airlock.CodeBox() as cb:
            # Install a third-party library at runtime (equivalent to pip install requests inside the sandbox)
            await cb.install_package("requests")

            output = await cb.run(
                "import requests; "
                "print(requests.get('https://api.github.com/zen').text)"
            )
            print(output)
    except RuntimeError as e:
        print(f"CodeBox failed to start: {e}")

if __name__ == "__main__":
    asyncio.run(main())
