// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @dev ERC-1271: signature validation for contract accounts.
interface IERC1271 {
    function isValidSignature(bytes32 hash, bytes calldata signature)
        external
        view
        returns (bytes4 magicValue);
}

/// @title TestUSDC
/// @notice A 6-decimal ERC-20 with EIP-3009 (transfer/receive/cancel with authorization) for LOCAL
///         chains and tests. Anyone may mint: never deploy it where its tokens could be mistaken for
///         real money.
/// @dev Behaves like Circle's FiatToken v2.2 on the EIP-3009 surface: the same EIP-712 type hashes,
///      domain (name, version, chainId, verifyingContract), check order and revert strings, so that
///      x402 clients and facilitators see the same results as against real USDC:
///        1. (receive only) caller must be `to`        "FiatTokenV2: caller must be the payee"
///        2. block.timestamp > validAfter              "FiatTokenV2: authorization is not yet valid"
///        3. block.timestamp < validBefore             "FiatTokenV2: authorization is expired"
///        4. (authorizer, nonce) unused                "FiatTokenV2: authorization is used or canceled"
///        5. signature valid for `from`                "FiatTokenV2: invalid signature"
///      For an account without code the signature must be 65 bytes (r, s, v), v in {27, 28} and s in
///      the lower half of the curve order (EIP-2), otherwise it reverts with the `ECRecover: ...`
///      strings of Circle's ECRecover. An account with code is asked through ERC-1271.
///      The (v, r, s) overloads pack `r ‖ s ‖ v` and take the same path as the `bytes` overloads.
///      No EIP-2612 permit and no `nonces`. The domain separator is cached and recomputed when the
///      chain id differs from the one at deployment (fork safety).
contract TestUSDC {
    // ---------------------------------------------------------------- ERC-20 state and events

    string public name;
    string public constant symbol = "USDC";
    uint8 public constant decimals = 6;
    uint256 public totalSupply;
    mapping(address account => uint256) public balanceOf;
    mapping(address owner => mapping(address spender => uint256)) public allowance;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    // ---------------------------------------------------------------- EIP-712 / EIP-3009

    bytes32 public constant TRANSFER_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    );
    bytes32 public constant RECEIVE_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "ReceiveWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    );
    bytes32 public constant CANCEL_AUTHORIZATION_TYPEHASH =
        keccak256("CancelAuthorization(address authorizer,bytes32 nonce)");

    bytes32 private constant _DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    /// @dev secp256k1 order n, halved (EIP-2 upper bound for s).
    uint256 private constant _HALF_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    string private _version;
    bytes32 private immutable _hashedName;
    bytes32 private immutable _hashedVersion;
    uint256 private immutable _deployChainId;
    bytes32 private immutable _deployDomainSeparator;

    mapping(address authorizer => mapping(bytes32 nonce => bool)) private _authorizationStates;

    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    event AuthorizationCanceled(address indexed authorizer, bytes32 indexed nonce);

    /// @param name_    ERC-20 name and EIP-712 domain name (real USDC: "USD Coin" on Base, "USDC" on Base Sepolia)
    /// @param version_ EIP-712 domain version (real USDC: "2")
    constructor(string memory name_, string memory version_) {
        name = name_;
        _version = version_;
        _hashedName = keccak256(bytes(name_));
        _hashedVersion = keccak256(bytes(version_));
        _deployChainId = block.chainid;
        _deployDomainSeparator = _buildDomainSeparator();
    }

    // ---------------------------------------------------------------- ERC-20

    function transfer(address to, uint256 value) external returns (bool) {
        _transfer(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        _approve(msg.sender, spender, value);
        return true;
    }

    /// @dev Like FiatToken: the allowance is always decreased (no "infinite allowance" special case).
    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        require(value <= allowed, "ERC20: transfer amount exceeds allowance");
        _transfer(from, to, value);
        allowance[from][msg.sender] = allowed - value;
        return true;
    }

    /// @notice Open mint, for tests and local chains only.
    function mint(address to, uint256 amount) external {
        require(to != address(0), "FiatToken: mint to the zero address");
        require(amount > 0, "FiatToken: mint amount not greater than 0");
        totalSupply += amount;
        unchecked {
            balanceOf[to] += amount; // cannot overflow: bounded by totalSupply
        }
        emit Transfer(address(0), to, amount);
    }

    // ---------------------------------------------------------------- EIP-712 views

    /// @notice EIP-712 domain version ("2" for USDC).
    function version() external view returns (string memory) {
        return _version;
    }

    // solhint-disable-next-line func-name-mixedcase
    function DOMAIN_SEPARATOR() external view returns (bytes32) {
        return _domainSeparator();
    }

    /// @notice EIP-5267 description of the EIP-712 domain.
    function eip712Domain()
        external
        view
        returns (
            bytes1 fields,
            string memory name_,
            string memory version_,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        )
    {
        return (hex"0f", name, _version, block.chainid, address(this), bytes32(0), new uint256[](0));
    }

    // ---------------------------------------------------------------- EIP-3009

    /// @notice Whether `nonce` of `authorizer` was used or canceled.
    function authorizationState(address authorizer, bytes32 nonce) external view returns (bool) {
        return _authorizationStates[authorizer][nonce];
    }

    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        _useAuthorization(
            TRANSFER_WITH_AUTHORIZATION_TYPEHASH,
            from,
            to,
            value,
            validAfter,
            validBefore,
            nonce,
            abi.encodePacked(r, s, v)
        );
    }

    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external {
        _useAuthorization(
            TRANSFER_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce, signature
        );
    }

    /// @notice Like transferWithAuthorization, but only the payee may submit it (no front-running).
    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        require(to == msg.sender, "FiatTokenV2: caller must be the payee");
        _useAuthorization(
            RECEIVE_WITH_AUTHORIZATION_TYPEHASH,
            from,
            to,
            value,
            validAfter,
            validBefore,
            nonce,
            abi.encodePacked(r, s, v)
        );
    }

    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external {
        require(to == msg.sender, "FiatTokenV2: caller must be the payee");
        _useAuthorization(
            RECEIVE_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce, signature
        );
    }

    function cancelAuthorization(address authorizer, bytes32 nonce, uint8 v, bytes32 r, bytes32 s) external {
        _cancelAuthorization(authorizer, nonce, abi.encodePacked(r, s, v));
    }

    function cancelAuthorization(address authorizer, bytes32 nonce, bytes calldata signature) external {
        _cancelAuthorization(authorizer, nonce, signature);
    }

    // ---------------------------------------------------------------- internals

    function _useAuthorization(
        bytes32 typehash,
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) private {
        // EIP-3009 validity windows are defined on block.timestamp.
        // forge-lint: disable-next-line(block-timestamp)
        require(block.timestamp > validAfter, "FiatTokenV2: authorization is not yet valid");
        // forge-lint: disable-next-line(block-timestamp)
        require(block.timestamp < validBefore, "FiatTokenV2: authorization is expired");
        _requireUnused(from, nonce);
        _requireValidSignature(
            from, keccak256(abi.encode(typehash, from, to, value, validAfter, validBefore, nonce)), signature
        );

        _authorizationStates[from][nonce] = true;
        emit AuthorizationUsed(from, nonce);
        _transfer(from, to, value);
    }

    function _cancelAuthorization(address authorizer, bytes32 nonce, bytes memory signature) private {
        _requireUnused(authorizer, nonce);
        _requireValidSignature(
            authorizer, keccak256(abi.encode(CANCEL_AUTHORIZATION_TYPEHASH, authorizer, nonce)), signature
        );
        _authorizationStates[authorizer][nonce] = true;
        emit AuthorizationCanceled(authorizer, nonce);
    }

    function _requireUnused(address authorizer, bytes32 nonce) private view {
        require(!_authorizationStates[authorizer][nonce], "FiatTokenV2: authorization is used or canceled");
    }

    function _requireValidSignature(address signer, bytes32 structHash, bytes memory signature) private view {
        bytes32 digest = keccak256(abi.encodePacked(hex"1901", _domainSeparator(), structHash));
        bool valid;
        if (signer.code.length == 0) {
            valid = _recover(digest, signature) == signer;
        } else {
            valid = _isValidERC1271Signature(signer, digest, signature);
        }
        require(valid, "FiatTokenV2: invalid signature");
    }

    /// @dev ecrecover with EIP-2 malleability and `v` checks; never returns address(0).
    function _recover(bytes32 digest, bytes memory signature) private pure returns (address signer) {
        require(signature.length == 65, "ECRecover: invalid signature length");
        bytes32 r;
        bytes32 s;
        uint8 v;
        assembly ("memory-safe") {
            r := mload(add(signature, 0x20))
            s := mload(add(signature, 0x40))
            v := byte(0, mload(add(signature, 0x60)))
        }
        require(uint256(s) <= _HALF_ORDER, "ECRecover: invalid signature 's' value");
        require(v == 27 || v == 28, "ECRecover: invalid signature 'v' value");
        signer = ecrecover(digest, v, r, s);
        require(signer != address(0), "ECRecover: invalid signature");
    }

    /// @dev True only when the staticcall succeeds and returns at least 32 bytes whose first word is
    ///      the ERC-1271 magic value left-aligned; any failure counts as "invalid", never a revert.
    function _isValidERC1271Signature(address signer, bytes32 digest, bytes memory signature)
        private
        view
        returns (bool)
    {
        (bool ok, bytes memory ret) =
            signer.staticcall(abi.encodeCall(IERC1271.isValidSignature, (digest, signature)));
        return
            ok && ret.length >= 32
                && abi.decode(ret, (bytes32)) == bytes32(IERC1271.isValidSignature.selector);
    }

    function _domainSeparator() private view returns (bytes32) {
        return block.chainid == _deployChainId ? _deployDomainSeparator : _buildDomainSeparator();
    }

    function _buildDomainSeparator() private view returns (bytes32) {
        return
            keccak256(abi.encode(_DOMAIN_TYPEHASH, _hashedName, _hashedVersion, block.chainid, address(this)));
    }

    function _transfer(address from, address to, uint256 value) private {
        require(from != address(0), "ERC20: transfer from the zero address");
        require(to != address(0), "ERC20: transfer to the zero address");
        uint256 fromBalance = balanceOf[from];
        require(value <= fromBalance, "ERC20: transfer amount exceeds balance");
        unchecked {
            balanceOf[from] = fromBalance - value;
            balanceOf[to] += value; // cannot overflow: the sum of balances is totalSupply
        }
        emit Transfer(from, to, value);
    }

    function _approve(address owner, address spender, uint256 value) private {
        require(owner != address(0), "ERC20: approve from the zero address");
        require(spender != address(0), "ERC20: approve to the zero address");
        allowance[owner][spender] = value;
        emit Approval(owner, spender, value);
    }
}
