// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @dev ERC-1271 smart wallet: a signature is valid when it is `owner`'s ECDSA signature of the
///      digest. `mode` lets tests make it misbehave.
contract MockERC1271Wallet {
    enum Mode {
        Honest,
        WrongMagic,
        Reverts,
        ShortReturn,
        AlwaysValid
    }

    address public immutable owner;
    Mode public mode;

    constructor(address owner_) {
        owner = owner_;
    }

    function setMode(Mode m) external {
        mode = m;
    }

    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        Mode m = mode;
        if (m == Mode.Reverts) revert("wallet: no");
        if (m == Mode.ShortReturn) {
            assembly {
                mstore(0, 0x1626ba7e00000000000000000000000000000000000000000000000000000000)
                return(0, 4)
            }
        }
        if (m == Mode.AlwaysValid) return 0x1626ba7e;
        if (m == Mode.WrongMagic) return 0xffffffff;
        if (signature.length != 65) return 0xffffffff;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        return ecrecover(hash, v, r, s) == owner ? bytes4(0x1626ba7e) : bytes4(0xffffffff);
    }
}

/// @dev ERC-20-ish tokens with the three non-standard `transfer` behaviours a safe transfer must handle.
contract MockToken {
    enum Mode {
        ReturnsTrue,
        ReturnsFalse,
        ReturnsNothing,
        Reverts,
        ReturnsGarbage
    }

    Mode public mode;
    mapping(address => uint256) public balanceOf;

    function setMode(Mode m) external {
        mode = m;
    }

    function mint(address to, uint256 amount) external {
        balanceOf[to] += amount;
    }

    fallback() external {
        // transfer(address,uint256)
        require(msg.sig == 0xa9059cbb, "MockToken: unsupported");
        (address to, uint256 amount) = abi.decode(msg.data[4:], (address, uint256));
        Mode m = mode;
        if (m == Mode.Reverts) revert("MockToken: revert");
        if (m == Mode.ReturnsFalse) {
            assembly {
                mstore(0, 0)
                return(0, 32)
            }
        }
        balanceOf[msg.sender] -= amount;
        balanceOf[to] += amount;
        if (m == Mode.ReturnsNothing) {
            assembly {
                return(0, 0)
            }
        }
        if (m == Mode.ReturnsGarbage) {
            assembly {
                mstore(0, 2)
                return(0, 32)
            }
        }
        assembly {
            mstore(0, 1)
            return(0, 32)
        }
    }
}

/// @dev A contract that tries to re-enter the receiver from inside the token call.
contract ReentrantToken {
    address public target;
    bytes public payload;
    bool public reentered;
    bool public reentrySucceeded;

    function arm(address target_, bytes calldata payload_) external {
        target = target_;
        payload = payload_;
    }

    function receiveWithAuthorization(address, address, uint256, uint256, uint256, bytes32, bytes calldata)
        external
    {
        reentered = true;
        (reentrySucceeded,) = target.call(payload);
    }
}
